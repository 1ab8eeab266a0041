"""The FL round loop (sequential back end).

Sampling, local training, aggregation, evaluation, and writing each round to the
run store.

All randomness derives from the run seed: client sampling of round r from
``(seed, "sample", r)``, client k's training generator in round r from
``(seed, "client", r, k)``, extra training in ``begin_round`` from ``(seed, tag, r, k)``.
Nothing touches the global RNG, so the same seed gives bit-identical checkpoints and a
resumed run equals an uninterrupted one.

Back ends (config ``backend``): ``sequential`` trains the clients of a round one after the
other; ``vectorized`` trains them all at once with ``torch.func`` (:mod:`fl.vectorized`),
drawing the same mini-batches from the same generators, so both give the same models to
floating-point tolerance; ``auto`` takes one of the two by :func:`fl.vectorized.choose_backend`'s
rule of the algorithm, the model and the device.
"""
from __future__ import annotations

import dataclasses
import functools
import sys
import time
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor, nn

from landscape.infra.devices import reproducible
from landscape.infra.errors import ConfigError

from .algorithms.base import Algorithm, ClientUpdate, EvalContext, LocalContext, RoundContext, State
from .config import BACKENDS
from .evaluation import evaluate
from .federation import Federation, sample_clients
from .manifest import record_round, verify
from .reader import Run
from .rounds import RoundPlan, TrainRequest, client_context, client_metrics
from .rundir import saves_clients
from .store import RunStore, check_round_finite
from .tracker import tracker_for
from .update_checks import enforce_policy, update_problem
from .vectorized import choose_backend, train_clients, unsupported_reason

PARALLEL_BACKENDS = ("loky", "processes", "ray", "dask")  # through landscape.distributed (joblib)


def _to(state: Mapping[str, Tensor], device: torch.device) -> State:
    return {k: v.detach().to(device) for k, v in state.items()}


class Engine:
    """Runs rounds ``last complete + 1 .. T`` of one run and stores each of them.

    Parameters
    ----------
    config : Mapping[str, Any]
        The stored configuration.
    store : RunStore
        The run folder.
    algorithm : Algorithm
        The algorithm (``fl.resolve.make_algorithm``).
    template : nn.Module
        The plain architecture with the initial weights.
    data : Federation
        The data on the device.
    device : torch.device
        Where training runs.
    progress : bool, optional
        Show a tqdm bar (default: when stderr is a terminal).
    on_round : callable, optional
        ``f(round, metrics)`` after each stored round.
    remote : callable, optional
        ``f(TrainRequest) -> {client: ClientUpdate}``: trains clients elsewhere (a Flower
        federation, :mod:`fl.flower.algorithms`) instead of the back end of ``config``.

    Raises
    ------
    ConfigError
        For a back end that cannot train this run (``fl.vectorized.unsupported_reason``).
    """

    def __init__(self, config: Mapping[str, Any], store: RunStore, algorithm: Algorithm,
                 template: nn.Module, data: Federation, device: torch.device,
                 progress: bool | None = None, on_round: Callable[[int, dict], None] | None = None,
                 remote: Callable[[TrainRequest], dict[int, ClientUpdate]] | None = None):
        self.config = config
        self.remote = remote
        self.store = store
        self.alg = algorithm
        self.device = device
        self.data = data
        self.template = template
        self.module = algorithm.build_module(template).to(device)
        self.custom_arch = self.module is not template
        self.keys = list(self.module.state_dict().keys())
        self.seed = int(config["seed"])
        self.on_round = on_round
        self.progress = sys.stderr.isatty() if progress is None else bool(progress)
        self.global_state: State = {}
        self.server_state: State = {}
        self.client_states: dict[int, State] = {}
        self.manifest: dict[str, Any] | None = None  # as last recorded (record_round's ``previous``)
        self.backend = str(config.get("backend", "sequential"))
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        self.chosen = self.backend == "auto" and remote is None  # then each round records the back end it took
        if self.backend == "auto":
            self.backend, _ = choose_backend(algorithm, self.module, device)
        if self.backend == "vectorized":
            reason = unsupported_reason(algorithm, self.module)
            if reason is not None:
                raise ConfigError(f"the vectorized back end cannot train this run: {reason}; "
                                  "use backend='sequential'")
        self.tracker = tracker_for(config, template, data.train_x, data.train_y, data.client_train, device, store)

    # --------------------------------------------------------------------- run
    def run(self) -> None:
        """Start (round 0) or resume, then train and store every remaining round.

        Raises
        ------
        RunDivergedError
            When a round's global model or a metric is not finite (that round is not stored).
        """
        from landscape.infra.progress import progress_bar

        last = self.begin()
        rounds = int(self.config["rounds"])
        bar = progress_bar(total=rounds, initial=last, disable=not self.progress, unit="round",
                   desc=f"{self.config['algorithm']} on {self.config['dataset']}")
        with bar, reproducible(self.device):
            for r in range(last + 1, rounds + 1):
                record = self._round(r)
                bar.update(1)
                bar.set_postfix(acc=f"{record['test_accuracy']:.3f}", loss=f"{record['test_loss']:.3f}")
                if self.on_round is not None:
                    self.on_round(r, record)

    def begin(self) -> int:
        """Store round 0 of a new run, or load the last complete round of a started one.

        Returns
        -------
        int
            The last stored round (0 for a new run).
        """
        last = self.store.read_progress()
        if last is None:
            self._start()
            return 0
        self._resume(last)
        return last

    def replay(self, source: Run, through: int) -> None:
        """Store rounds 0..``through`` of a new run as copies of ``source``'s.

        For an algorithm whose :meth:`~fl.algorithms.base.Algorithm.branch_base` is the
        source's algorithm through that round (checked by :func:`fl.branch`): the global
        models, client checkpoints and metrics records are the source's, the server state is
        rebuilt by ``branch_state``, and :meth:`run` then resumes after round ``through``.

        Parameters
        ----------
        source : Run
            A stored run of the same configuration but the algorithm.
        through : int
            The last round copied.
        """
        kept = source.kept_client_states() if through == source.rounds[-1] else {}
        self.client_states = {k: _to(s, self.device) for k, s in kept.items()}
        stored = functools.lru_cache(maxsize=8)(source.global_state)  # branch_state re-reads recent rounds
        for r in range(through + 1):
            self.global_state = _to(stored(r), self.device)
            self.server_state = _to(self.alg.branch_state(r, source.algorithm_state(r), stored), self.device)
            clients = {k: self._trained(s) for k, s in source.client_states(r).items()} \
                if r and saves_clients(self.config, r) else {}
            self._write(r, clients, self.client_states if r == through else {}, source.metrics[r])

    def _start(self) -> None:
        self.store.truncate_metrics(-1)  # drop lines of an attempt that never completed round 0
        self.global_state = _to(self.module.state_dict(), self.device)
        self.global_state = {k: v.clone() for k, v in self.global_state.items()}
        self.server_state = _to(self.alg.init_server_state(self.global_state), self.device)
        start = time.perf_counter()
        loss, acc = self._evaluate(self.global_state)
        record = {"round": 0, "test_loss": loss, "test_accuracy": acc, "time": time.perf_counter() - start}
        if self.tracker is not None:
            record.update(self.tracker.record(0, self.alg.export_state(self.global_state, self.server_state), {}))
        self._write(0, {}, {}, record)

    def _resume(self, last: int) -> None:
        st = self.store
        manifest = verify(st, last, client_state=True)  # the folder is the run its manifest records
        self.manifest = manifest.data  # fl.run checked the partition against the seed
        path = st.train_path(last) if self.custom_arch else st.global_path(last)
        loaded = st.read_state(path, manifest.digest_of(path))
        self.global_state = {k: loaded[k].to(self.device) for k in self.keys}
        server = st.read_optional_state(st.state_path(last), manifest.digest_of(st.state_path(last)))
        self.server_state = _to(server, self.device)
        clients = st.read_client_states(last, manifest.digest_of(st.client_state_path(last)))
        self.client_states = {k: _to(s, self.device) for k, s in clients.items()}
        st.truncate_metrics(last)

    # ------------------------------------------------------------------- round
    def _round(self, r: int) -> dict[str, Any]:
        plan = self.plan_round(r)
        return self.finish_round(plan, self.train(r, plan.clients, "client", plan.sent, plan.server_state))

    def plan_round(self, r: int) -> RoundPlan:
        """Steps 1-2 of round ``r``: sample the clients, run the algorithm's ``begin_round``.

        Parameters
        ----------
        r : int
            The round (the last stored round + 1).

        Returns
        -------
        RoundPlan
            The clients to train, the model and server state they receive.
        """
        start = time.perf_counter()
        cfg = self.config
        sampled = sample_clients(self.seed, r, int(cfg["clients"]), float(cfg["participation"]))
        clients = self.alg.participants(r, list(sampled))
        sent = self.global_state

        def train(ids: Sequence[int], tag: str) -> dict[int, ClientUpdate]:
            return self.train(r, ids, tag, sent, self.server_state)

        self.server_state = self.alg.begin_round(
            RoundContext(r, sent, self.server_state, list(sampled), int(cfg["clients"]), train,
                         [len(i) for i in self.data.client_train]))
        return RoundPlan(r, list(clients), sent, self.server_state, start)

    def finish_round(self, plan: RoundPlan, updates: Mapping[int, ClientUpdate],
                     refused: Mapping[int, str] | None = None) -> dict[str, Any]:
        """Steps 3-5 of a planned round: check the updates, keep client states, aggregate, evaluate, store.

        Every update is checked against the model the round sent (:mod:`fl.update_checks`) before
        anything reaches the server's state. A refused client stops the run or, with
        ``bad_clients="drop"``, is left out of the round and recorded in its record
        (``dropped``, ``dropped_reasons``).

        Parameters
        ----------
        plan : RoundPlan
            What :meth:`plan_round` returned.
        updates : Mapping[int, ClientUpdate]
            Client id -> its update, for every client of the plan not in ``refused``.
        refused : Mapping[int, str], optional
            Clients already refused by whoever received their replies, with the reason (a
            remote client that did not answer, or sent a reply that could not be read).

        Returns
        -------
        dict[str, Any]
            The round's metrics record (also appended to metrics.jsonl).

        Raises
        ------
        ConfigError
            When an update is missing or comes from a client outside the plan.
        ClientRefused
            For a refused client when ``bad_clients`` is ``"stop"``.
        FederationError
            When every client of the round was refused.
        """
        r = plan.round
        if sorted([*updates, *(refused or {})]) != sorted(plan.clients):
            raise ConfigError(f"round {r}: updates came from clients {sorted(updates)}, the round trained "
                              f"{sorted(plan.clients)}")
        refused = self.refusals(plan.sent, updates, refused)
        enforce_policy(str(self.config.get("bad_clients", "stop")), r, refused, len(plan.clients))
        kept = [k for k in plan.clients if k not in refused]
        updates = {k: self._complete(updates[k], plan.sent) for k in kept}  # the plan's order
        for k, u in updates.items():
            if u.client_state is not None:
                self.client_states[k] = {n: t.detach() for n, t in u.client_state.items()}
        self.global_state, self.server_state = self.alg.aggregate(plan.sent, updates, plan.server_state, r)
        loss, acc = self._evaluate(self.global_state)
        record: dict[str, Any] = {"round": r, "test_loss": loss, "test_accuracy": acc,
                                  "lr": self.alg.lr(r), "clients": list(kept)}
        if refused:
            record.update(dropped=sorted(refused),
                          dropped_reasons=[f"client {k}: {refused[k]}" for k in sorted(refused)])
        if self.chosen:
            record["backend"] = self.backend
        record.update(client_metrics(updates))
        record.update(self.alg.local_metrics(EvalContext(
            r, self.global_state, self.server_state, self.client_states, updates, self._local_test(),
            (self.data.test_x, self.data.test_y), self._evaluate_with, self.module, self.device)))
        record["time"] = time.perf_counter() - plan.start
        saved, tracked = saves_clients(self.config, r), self.tracker is not None and self.tracker.due(r)
        exported = {k: self._trained(self.alg.export_state(u.state, plan.server_state, k, self.client_states.get(k)))
                    for k, u in updates.items()} if saved or tracked else {}
        if tracked:  # measured on the models as stored, after the round's own time
            record.update(self.tracker.record(r, self.alg.export_state(self.global_state, self.server_state), exported))
        self._write(r, exported if saved else {}, self.client_states, record)
        return record

    def refusals(self, sent: State, updates: Mapping[int, ClientUpdate],
                  refused: Mapping[int, str] | None = None) -> dict[int, str]:
        """The clients whose updates :func:`fl.update_checks.update_problem` refuses, with why.

        Each update is checked against the model ``sent``, the run's frozen entries, the persisted
        state the server holds for that client and the client's sample count in the partition;
        non-finite values count only for remote clients (for the engine's own back ends they are
        the run diverging, reported when the round is stored).

        Parameters
        ----------
        sent : State
            The model the clients received.
        updates : Mapping[int, ClientUpdate]
            Client id -> update.
        refused : Mapping[int, str], optional
            Clients refused already (kept in the result).

        Returns
        -------
        dict[int, str]
            Client id -> the one-line reason, for ``refused`` and every refused update.
        """
        out = dict(refused or {})
        for k, update in updates.items():
            problem = None if k in out else update_problem(
                update, sent, frozen=self.alg.frozen, client_state=self.client_states.get(k),
                samples=len(self.data.client_train[k]), finite=self.remote is not None)
            if problem is not None:
                out[k] = problem
        return out

    def _complete(self, update: ClientUpdate, sent: State) -> ClientUpdate:
        """The update with the frozen parameters a remote client left out (they are ``sent``'s)."""
        missing = [n for n in self.alg.frozen if n not in update.state]
        if not missing:
            return update
        return dataclasses.replace(update, state={n: update.state[n] if n in update.state else sent[n]
                                                  for n in sent})

    def _trained(self, state: State) -> State:
        """A client checkpoint: the state without the frozen parameters (the global model's)."""
        return {n: t for n, t in state.items() if n not in self.alg.frozen}

    def train(self, r: int, ids: Sequence[int], tag: str, sent: State, server_state: State
              ) -> dict[int, ClientUpdate]:
        """Client updates of ``ids`` in round ``r`` with the configured back end (or ``remote``).

        Parameters
        ----------
        r : int
            The round.
        ids : Sequence[int]
            The clients to train.
        tag : str
            The generator tag (``"client"`` for the round's training, others in ``begin_round``).
        sent, server_state : State
            The model the clients receive and the algorithm's server state.

        Returns
        -------
        dict[int, ClientUpdate]
            Client id -> update.
        """
        if self.remote is not None:
            return self.remote(TrainRequest(r, list(ids), tag, sent, server_state,
                                            {k: self.client_states.get(k, {}) for k in ids}))
        if self.backend == "vectorized" and len(ids) > 1:
            return train_clients(self.alg, [self._context(r, k, tag, sent, server_state) for k in ids])
        if self.backend in PARALLEL_BACKENDS and len(ids) > 1:
            from landscape.infra.parallel import map_calls, to_device

            contexts = [(self._context(r, k, tag, sent, server_state),) for k in ids]
            updates = map_calls(self.alg.client_update, contexts, self.backend,
                                n_jobs=int(self.config.get("n_jobs") or 2))
            return {k: to_device(u, self.device) for k, u in zip(ids, updates)}
        return {k: self.alg.client_update(self._context(r, k, tag, sent, server_state)) for k in ids}

    def _context(self, r: int, k: int, tag: str, sent: State, server_state: State) -> LocalContext:
        return client_context(self.config, self.alg, self.module, self.data, self.device,
                              TrainRequest(r, [k], tag, sent, server_state, {k: self.client_states.get(k, {})}), k)

    def _local_test(self) -> dict[int, tuple[Tensor, Tensor]]:
        return {k: (self.data.train_x[i], self.data.train_y[i])
                for k, i in enumerate(self.data.client_test) if len(i)}

    # -------------------------------------------------------------- evaluation
    def _evaluate(self, state: State) -> tuple[float, float]:
        return evaluate(self.module, state, self.data.test_x, self.data.test_y,
                        batch_size=int(self.config["eval_batch_size"]))

    def _evaluate_with(self, state: State, x: Tensor, y: Tensor, module: nn.Module | None = None
                       ) -> tuple[float, float]:
        return evaluate(self.module if module is None else module, state, x, y,
                        batch_size=int(self.config["eval_batch_size"]))

    # ------------------------------------------------------------------ output
    def _write(self, r: int, clients: Mapping[int, State], client_states: Mapping[int, State],
               record: Mapping[str, Any]) -> None:
        """Write every file of round r, then the metrics line, the manifest, the progress marker.

        Nothing is written when the global model or a metric is not finite:
        ``RunDivergedError``.
        """
        check_round_finite(r, self.global_state, record)
        st = self.store
        for k, state in clients.items():
            st.write_state(st.client_path(r, k), state)
        st.write_state(st.global_path(r), self.alg.export_state(self.global_state, self.server_state))
        if self.custom_arch:
            st.write_state(st.train_path(r), self.global_state)
        if self.server_state:
            st.write_state(st.state_path(r), self.server_state)
        st.write_client_states(r, client_states)
        st.append_metrics(record)
        self.manifest = record_round(st, r, record, self.manifest)
        st.mark(r, complete=r == int(self.config["rounds"]))
        st.prune_client_states(r)

