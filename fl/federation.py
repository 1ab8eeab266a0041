"""The run's data on the device and the clients of each round (:func:`sample_clients`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor

from .algorithms.base import derive_seed
from .config import sample_size


@dataclass
class Federation:
    """The run's data on the device: the training pool split by client index arrays.

    Parameters
    ----------
    train_x, train_y, test_x, test_y : Tensor
        Training pool and global test set.
    client_train : list[Tensor]
        Index tensors into ``train_x``, one per client.
    client_test : list[Tensor]
        Local test splits (index tensors into ``train_x``; may be empty).
    num_classes : int
        Number of classes.
    """

    train_x: Tensor
    train_y: Tensor
    test_x: Tensor
    test_y: Tensor
    client_train: list[Tensor]   # index tensors into train_x, one per client
    client_test: list[Tensor]    # local test splits (may be empty)
    num_classes: int

    @classmethod
    def build(cls, bundle: Any, train_parts: Sequence[np.ndarray], test_parts: Sequence[np.ndarray],
              device: torch.device) -> "Federation":
        """Move a dataset and its client split to ``device``.

        Parameters
        ----------
        bundle : DataBundle
            The dataset (``fl.datasets.load_dataset``).
        train_parts, test_parts : Sequence[np.ndarray]
            Client training and local test index arrays.
        device : torch.device
            Where the tensors go.

        Returns
        -------
        Federation
            The data of the run.
        """
        def idx(p: np.ndarray) -> Tensor:
            return torch.as_tensor(np.asarray(p, dtype=np.int64), device=device)

        return cls(bundle.train_x.to(device), bundle.train_y.to(device), bundle.test_x.to(device),
                   bundle.test_y.to(device), [idx(p) for p in train_parts], [idx(p) for p in test_parts],
                   int(bundle.num_classes))


def sample_clients(seed: int, round: int, num_clients: int, participation: float) -> list[int]:
    """The clients of a round.

    :func:`fl.config.sample_size` of them drawn uniformly without replacement from the
    generator of ``(seed, "sample", round)``.

    Parameters
    ----------
    seed : int
        Run seed.
    round : int
        Training round.
    num_clients : int
        K.
    participation : float
        Share of clients per round, in (0, 1].

    Returns
    -------
    list[int]
        Sorted client ids (all of them when the share rounds to K).
    """
    m = sample_size(num_clients, participation)
    if m >= num_clients:
        return list(range(num_clients))
    rng = np.random.default_rng(derive_seed(seed, "sample", round))
    return sorted(int(k) for k in rng.choice(num_clients, size=m, replace=False))

