"""Seeds of the FL engine.

Every random stream derives from the run seed and string or integer keys (``(seed,
"client", round, client)``, ``(seed, "sample", round)``, ...), so a resumed run equals an
uninterrupted one and nothing touches the global RNG.
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch

from landscape.infra.errors import ConfigError


def derive_seed(*keys: int | str) -> int:
    """A 63-bit seed from a tuple of keys (numpy ``SeedSequence`` of the key words).

    Parameters
    ----------
    *keys : int | str
        Non-negative integers, or strings (hashed to 32-bit words with SHA-256).

    Returns
    -------
    int
        A seed in ``[0, 2^63)``.

    Raises
    ------
    ConfigError
        For a negative integer key.
    """
    words = [int(k) if not isinstance(k, str) else
             int.from_bytes(hashlib.sha256(k.encode()).digest()[:4], "little") for k in keys]
    if any(w < 0 for w in words):
        raise ConfigError(f"seed keys must be non-negative, got {keys}")
    return int(np.random.SeedSequence(words).generate_state(2, dtype=np.uint32).view(np.uint64)[0]
               >> np.uint64(1))


def make_generator(*keys: int | str) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with :func:`derive_seed` of ``keys``.

    Parameters
    ----------
    *keys : int | str
        As for :func:`derive_seed`.

    Returns
    -------
    torch.Generator
        A fresh generator.
    """
    gen = torch.Generator()
    gen.manual_seed(derive_seed(*keys))
    return gen
