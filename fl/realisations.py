"""Several realisations of a round's client models: the same local training, other mini-batch orders.

IMA's decomposition of the weighted ensemble's loss (Zhou et al., TMC 2024, Theorem 1)
has a variance and a covariance term: the spread of each client's model over realisations
of its local training, and how the clients' deviations co-vary. One stored model per client
makes both 0 by construction. :func:`retrain_clients` trains a round's clients again from
the global model they received, with the run's own client update in the context the engine
gave them, only the generator seeded from another tag; :func:`realisations` collects
``count`` such realisations per client (the stored model first), as
:func:`landscape.decompose` takes them.

The client update must depend only on the received model and the client's data (FedAvg,
FedProx, IMA around them): an algorithm with server or client state (anchors, personal
models, control variates) is refused.
"""
from __future__ import annotations

from pathlib import Path

from torch.utils.data import TensorDataset

from landscape.infra.devices import resolve_device
from landscape.infra.errors import ConfigError
from landscape.space.checkpoints import load_state_dict, save_state_dict

from .algorithms.base import Algorithm, LocalContext, State, make_generator
from .config import config_digest
from .reader import Run
from .resolve import make_algorithm

#: Algorithms whose client update sees only the received model and the client's data.
STATELESS = ("fedavg", "fedprox")


def _stateless(alg: Algorithm) -> bool:
    return alg.name in STATELESS or (alg.wraps and _stateless(alg.base))  # type: ignore[attr-defined]


def retrain_clients(run: Run, tag: str, round: int = -1) -> dict[int, State]:
    """The client models of ``round`` trained again from the global model they received.

    Each client of round r runs the run's own client update (``Algorithm.client_update``,
    local SGD for FedAvg) from the global model of round r - 1, with the learning rate,
    epochs and optimiser the engine gave it, and its generator seeded from
    ``(run seed, tag, r, client)``. Tag ``"client"`` is the engine's own stream and gives
    back the stored client models bit for bit; any other tag changes only the order of the
    mini-batches.

    Parameters
    ----------
    run : Run
        A run that stored the client models of ``round``.
    tag : str
        Key of the generators' seeds.
    round : int
        A training round (negative: from the end).

    Returns
    -------
    dict[int, State]
        Client id -> state_dict (on the CPU).

    Raises
    ------
    ConfigError
        For an algorithm whose client update depends on more than the received model and the
        data, or round 0.
    """
    cfg = run.config
    alg = make_algorithm(cfg)
    if not _stateless(alg):
        raise ConfigError(f"retraining needs a client update that depends only on the received model and the "
                          f"data ({', '.join(STATELESS)}, or IMA around them); {alg.label!r} keeps other state")
    r = run.rounds[round]
    if r == 0:
        raise ConfigError("round 0 is the initial model: no client trained in it")
    device = resolve_device(cfg["device"])
    module = alg.build_module(run.module()).to(device)
    sent = {k: v.to(device) for k, v in run.training_state(r - 1).items()}
    data = run.client_datasets()
    trained = {}
    for k in sorted(run.client_states(r)):
        x, y = (t.to(device) for t in data[k].tensors)
        ctx = LocalContext(round=r, client=k, global_state=sent, server_state={}, client_state={}, x=x, y=y,
                           generator=make_generator(int(cfg["seed"]), tag, r, k), lr=alg.lr(r),
                           local_epochs=alg.local_epochs(r), batch_size=int(cfg["batch_size"]),
                           momentum=float(cfg["momentum"]), weight_decay=float(cfg["weight_decay"]),
                           module=module, options=alg.opts, config=cfg, device=device,
                           num_classes=int(cfg["num_classes"]))
        state = alg.export_state(alg.client_update(ctx).state, {}, k)
        trained[k] = {n: t.detach().cpu() for n, t in state.items()}
    return trained


def realisations(run: Run, count: int, folder: str | Path, round: int = -1
                 ) -> tuple[list[list[State]], list[TensorDataset]]:
    """Per client of ``round``, ``count`` realisations of its model.

    The stored client model, then :func:`retrain_clients` with tags ``realisation-1`` ..
    ``realisation-{count-1}``, each kept in ``folder`` (named by the run folder, its
    configuration digest, the round and the tag) and read back by a later call.

    Parameters
    ----------
    run : Run
        A run that stored the client models of ``round``.
    count : int
        Realisations per client (at least 2 for a variance).
    folder : str or Path
        Where the retrained client models are kept.
    round : int
        A training round (negative: from the end).

    Returns
    -------
    tuple[list[list[State]], list[TensorDataset]]
        ``(models, datasets)``: per client (sorted ids) its realisations and its training
        data, the arguments of :func:`landscape.decompose`.

    Raises
    ------
    ConfigError
        For ``count < 1`` and as :func:`retrain_clients`.

    Examples
    --------
    >>> models, data = realisations(run, 5, "realisations")               # doctest: +SKIP
    >>> landscape.decompose(models, data, evaluator).variance             # doctest: +SKIP
    """
    if count < 1:
        raise ConfigError(f"count must be at least 1, got {count}")
    r = run.rounds[round]
    stored = run.client_states(r)
    ids = sorted(stored)
    models = {k: [stored[k]] for k in ids}
    folder = Path(folder)
    for s in range(1, count):
        path = folder / f"{run.path.name}-{config_digest(run.config)}-round{r}-realisation-{s}.safetensors"
        if not path.exists():
            trained = retrain_clients(run, f"realisation-{s}", r)
            folder.mkdir(parents=True, exist_ok=True)
            save_state_dict({f"{k}/{n}": t for k in ids for n, t in trained[k].items()}, path)
        flat = load_state_dict(path)
        for k in ids:
            models[k].append({n: flat[f"{k}/{n}"] for n in stored[k]})
    data = run.client_datasets()
    return [models[k] for k in ids], [data[k] for k in ids]
